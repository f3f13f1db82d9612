// `kvpack inspect FILE.gguf [--json] [--tensors]`: version, alignment, metadata (arrays summarised), the model
// config kvpack derives, and optionally the tensor table. `kvpack inspect FILE.kvcal [--json]`: the calibration
// file's version, model, provenance, fp8 scales and each q format's bit allocations (distinct width patterns).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <string_view>

#include "command.h"
#include "kvpack/calibration.h"
#include "kvpack/error.h"
#include "kvpack/formats.h"
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

// How many width patterns `inspect` lists per format and K|V (all of them are counted).
constexpr size_t kPatternsShown = 5;

int run_calibration(const std::string& path, const kvpack::Calibration& cal, bool json) {
  const auto& scales = cal.fp8_scales();
  const auto [smin, smax] = std::minmax_element(scales.begin(), scales.end());
  ordered_json j;
  j["file"] = path;
  j["kind"] = "kvpack calibration";
  j["version"] = kvpack::kCalibrationVersion;
  j["model_name"] = cal.model_config().name;
  j["model_id"] = cal.model_id();
  j["layers"] = cal.n_layers();
  j["kv_heads"] = cal.n_kv_heads();
  j["head_dim"] = cal.head_dim();
  j["info"] = cal.info();
  j["fp8"] = {{"scale_min", *smin}, {"scale_max", *smax}};
  ordered_json formats = ordered_json::array();
  for (const auto& fi : kvpack::all_formats()) {
    const kvpack::Format f = fi.id;
    if (f == kvpack::Format::fp8 || !fi.calibrated || !cal.has(f)) continue;  // q formats (fp8 is shown above)
    const auto& t = cal.q(f);
    ordered_json fj{{"format", kvpack::format_name(f)},
                    {"bits_per_element", fi.bits_per_element},
                    {"code_bytes", kvpack::block::q_code_bytes(t.bits_x2, cal.head_dim())}};
    for (kvpack::KvKind kind : {kvpack::KvKind::K, kvpack::KvKind::V}) {
      const auto pats = kvpack::width_patterns(t, kind);
      ordered_json pj = ordered_json::array();
      for (const auto& p : pats) pj.push_back({{"bits", p.bits}, {"slots", p.slots}});
      fj[kind == kvpack::KvKind::K ? "K" : "V"] = {{"slots", t.n_slots / 2}, {"distinct", pats.size()}, {"patterns", pj}};
    }
    formats.push_back(fj);
  }
  j["formats"] = formats;
  if (json) {
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("file       {}\n", path);
  fmt::print("kind       kvpack calibration, version {}\n", kvpack::kCalibrationVersion);
  fmt::print("model      {} ({})\n", cal.model_config().name, cal.model_id());
  fmt::print("shape      {} layers x {} kv heads x head_dim {} ({} slots per K and V)\n", cal.n_layers(),
             cal.n_kv_heads(), cal.head_dim(), cal.n_layers() * cal.n_kv_heads());
  for (const auto& [k, v] : cal.info()) fmt::print("  {:<12} {}\n", k, v);
  fmt::print("fp8        static scales {:.4g} .. {:.4g}\n", *smin, *smax);
  for (const auto& fj : formats) {
    fmt::print("\n{}  ({:.4g} bits per element, {} code bytes per token)\n", fj["format"].get<std::string>(),
               fj["bits_per_element"].get<double>(), fj["code_bytes"].get<int>());
    for (const char* kind : {"K", "V"}) {
      const auto& kj = fj[kind];
      fmt::print("  {}: {} distinct width patterns over {} slots; most common:\n", kind, kj["distinct"].get<size_t>(),
                 kj["slots"].get<int>());
      for (size_t i = 0; i < kj["patterns"].size() && i < kPatternsShown; ++i)
        fmt::print("    [{}]  {} slot{}\n", fmt::join(kj["patterns"][i]["bits"].get<std::vector<int>>(), ","),
                   kj["patterns"][i]["slots"].get<int>(), kj["patterns"][i]["slots"].get<int>() == 1 ? "" : "s");
    }
  }
  return 0;
}

int run(const std::string& path, bool json, bool show_tensors) {
  // GGUF files start with "GGUF"; anything else is tried as a kvpack calibration file (a safetensors container).
  char magic[4] = {};
  {
    std::ifstream in(path, std::ios::binary);
    KVPACK_CHECK(in.good(), "{}: cannot open", path);
    in.read(magic, 4);
  }
  if (std::string_view(magic, 4) != "GGUF") {
    std::optional<kvpack::Calibration> cal;
    try {
      cal = kvpack::Calibration::load(path);
    } catch (const kvpack::Error& e) {
      kvpack::fail("{}: not a GGUF file (magic is {:02x} {:02x} {:02x} {:02x}) and not a kvpack calibration file ({})",
                   path, static_cast<uint8_t>(magic[0]), static_cast<uint8_t>(magic[1]), static_cast<uint8_t>(magic[2]),
                   static_cast<uint8_t>(magic[3]), e.what());
    }
    return run_calibration(path, *cal, json);
  }
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
  app->add_option("file", *path, "GGUF model file or kvpack calibration file (.kvcal)")->required();
  app->add_flag("--json", *json, "Print JSON instead of text");
  app->add_flag("--tensors", *tensors, "Also list every tensor (name, type, shape, offset, bytes; GGUF)");
  return [=] { return run(*path, *json, *tensors); };
}

const bool registered = kvpack::cli::register_command("inspect",
                                                     "Show a GGUF file's metadata, model shape and tensors, or a calibration file's contents", setup);

}  // namespace
