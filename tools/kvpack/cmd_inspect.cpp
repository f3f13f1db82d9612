// `kvpack inspect FILE.gguf [--json] [--tensors]`: version, alignment, metadata (arrays summarised), the model
// config kvpack derives, and optionally the tensor table.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>

#include "command.h"
#include "kvpack/error.h"
#include "kvpack/gguf.h"

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr size_t kFirstItems = 8;

ordered_json scalar_json(const kvpack::GgufValue& v) {
  using kvpack::GgufType;
  switch (v.type) {
    case GgufType::STRING: return *v.as_string();
    case GgufType::BOOL: return std::get<bool>(v.value);
    case GgufType::F32: case GgufType::F64: return std::get<double>(v.value);
    case GgufType::ARRAY: return v.summary(kFirstItems);
    default:
      if (const auto* u = std::get_if<uint64_t>(&v.value)) return *u;
      return std::get<int64_t>(v.value);
  }
}

ordered_json value_json(const kvpack::GgufValue& v) {
  ordered_json j;
  j["type"] = v.type_string();
  if (const auto* a = v.as_array()) {
    j["length"] = a->size();
    ordered_json first = ordered_json::array();
    for (size_t i = 0; i < a->size() && i < kFirstItems; ++i) first.push_back(scalar_json((*a)[i]));
    j["first"] = first;
  } else {
    j["value"] = scalar_json(v);
  }
  return j;
}

ordered_json config_json(const kvpack::ModelConfig& c) {
  return ordered_json{{"arch", c.arch},
                      {"name", c.name},
                      {"n_layers", c.n_layers},
                      {"d_model", c.d_model},
                      {"n_heads", c.n_heads},
                      {"n_kv_heads", c.n_kv_heads},
                      {"head_dim", c.head_dim},
                      {"d_ff", c.d_ff},
                      {"vocab_size", c.vocab_size},
                      {"max_context", c.max_context},
                      {"rope_theta", c.rope_theta},
                      {"rms_eps", c.rms_eps},
                      {"rope_scaling",
                       {{"type", c.rope_scaling.type},
                        {"factor", c.rope_scaling.factor},
                        {"low_freq_factor", c.rope_scaling.low_freq_factor},
                        {"high_freq_factor", c.rope_scaling.high_freq_factor},
                        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}}},
                      {"tied_embeddings", c.tied_embeddings},
                      {"attn_bias", c.attn_bias},
                      {"n_params", c.n_params},
                      {"bos_token_id", c.bos_token_id},
                      {"eos_token_id", c.eos_token_id},
                      {"kv_elements_per_token", c.kv_elements_per_token()}};
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", b, units[u]);
}

int run(const std::string& path, bool json, bool show_tensors) {
  const auto f = kvpack::GgufFile::open(path);
  std::optional<kvpack::ModelConfig> config;
  std::string config_error;
  try {
    config = kvpack::model_config_from_gguf(f);
  } catch (const kvpack::Error& e) {
    config_error = e.what();  // not a model kvpack runs; the rest of the file is still worth showing
  }
  uint64_t total_bytes = 0;
  int64_t total_elements = 0;
  std::map<std::string, int> type_counts;
  for (const auto& t : f.tensors()) {
    total_bytes += t.n_bytes;
    total_elements += t.n_elements;
    ++type_counts[std::string(kvpack::ggml_type_name(t.type))];
  }

  if (json) {
    ordered_json j;
    j["file"] = path;
    j["version"] = f.version();
    j["alignment"] = f.alignment();
    j["data_offset"] = f.data_offset();
    j["file_size"] = f.file_size();
    j["n_kv"] = f.keys().size();
    j["n_tensors"] = f.tensors().size();
    j["tensor_bytes"] = total_bytes;
    j["tensor_elements"] = total_elements;
    j["tensor_types"] = type_counts;
    ordered_json meta = ordered_json::object();
    for (const auto& k : f.keys()) meta[k] = value_json(*f.find(k));
    j["metadata"] = meta;
    if (config) j["model"] = config_json(*config);
    else j["model_error"] = config_error;
    if (show_tensors) {
      ordered_json ts = ordered_json::array();
      for (const auto& t : f.tensors())
        ts.push_back({{"name", t.name},
                      {"type", kvpack::ggml_type_name(t.type)},
                      {"shape", t.dims},
                      {"offset", t.offset},
                      {"bytes", t.n_bytes}});
      j["tensors"] = ts;
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }

  fmt::print("file       {}\n", path);
  fmt::print("version    {}\n", f.version());
  fmt::print("alignment  {}\n", f.alignment());
  fmt::print("data       at offset {} of {} bytes\n", f.data_offset(), f.file_size());
  std::string types;
  for (const auto& [name, n] : type_counts) types += fmt::format("{}{} x{}", types.empty() ? "" : ", ", name, n);
  fmt::print("tensors    {} ({} elements, {}; {})\n", f.tensors().size(), total_elements,
             human_bytes(static_cast<double>(total_bytes)), types);
  fmt::print("\nmetadata ({} keys)\n", f.keys().size());
  size_t width = 0;
  for (const auto& k : f.keys()) width = std::max(width, k.size());
  for (const auto& k : f.keys()) {
    const auto* v = f.find(k);
    fmt::print("  {:<{}}  {:<14} {}\n", k, width, v->type_string(), v->is_array() ? v->summary(kFirstItems).substr(
                                                                                          v->type_string().size() + 1)
                                                                                    : v->summary(kFirstItems, 100));
  }
  fmt::print("\nmodel\n");
  if (config) {
    const auto& c = *config;
    fmt::print("  arch {}  name \"{}\"\n", c.arch, c.name);
    fmt::print("  layers {}  d_model {}  heads {} (kv {}, group {})  head_dim {}  d_ff {}  vocab {}\n", c.n_layers,
               c.d_model, c.n_heads, c.n_kv_heads, c.group_size(), c.head_dim, c.d_ff, c.vocab_size);
    fmt::print("  context {}  rope_theta {}  rope_scaling {}", c.max_context, c.rope_theta, c.rope_scaling.type);
    if (c.rope_scaling.type != "none") fmt::print(" (factor {})", c.rope_scaling.factor);
    fmt::print("  rms_eps {:g}\n", c.rms_eps);
    fmt::print("  tied_embeddings {}  attn_bias {}  params {}  bos {}  eos {}\n", c.tied_embeddings, c.attn_bias,
               c.n_params, c.bos_token_id, c.eos_token_id);
    fmt::print("  KV cache: {} elements per token ({} per token in bf16)\n", c.kv_elements_per_token(),
               human_bytes(2.0 * static_cast<double>(c.kv_elements_per_token())));
  } else {
    fmt::print("  unavailable: {}\n", config_error);
  }
  if (show_tensors) {
    size_t nw = 4;
    for (const auto& t : f.tensors()) nw = std::max(nw, t.name.size());
    fmt::print("\n  {:<{}}  {:<6} {:<22} {:>12} {:>12}\n", "name", nw, "type", "shape", "offset", "bytes");
    for (const auto& t : f.tensors())
      fmt::print("  {:<{}}  {:<6} {:<22} {:>12} {:>12}\n", t.name, nw, kvpack::ggml_type_name(t.type),
                 t.shape_string(), t.offset, t.n_bytes);
  }
  return 0;
}

kvpack::cli::Runner setup(CLI::App* app) {
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto tensors = std::make_shared<bool>(false);
  app->add_option("file", *path, "GGUF file")->required();
  app->add_flag("--json", *json, "Print JSON instead of text");
  app->add_flag("--tensors", *tensors, "Also list every tensor (name, type, shape, offset, bytes)");
  return [=] { return run(*path, *json, *tensors); };
}

const bool registered = kvpack::cli::register_command("inspect", "Show a GGUF file's metadata, model shape and tensors", setup);

}  // namespace
