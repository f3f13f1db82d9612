// HF config.json reader. Strict on what changes the model's shape or arithmetic (sizes, rope scaling, biases,
// activation), lenient on everything else (HF configs carry many unrelated keys that differ between versions).
#include "kvpack/hf_config.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "kvpack/error.h"

namespace kvpack {
namespace {

using json = nlohmann::json;

// Short rendering of a JSON value for error messages (a long array should not flood the terminal).
std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string type_word(const json& v) {
  if (v.is_number_float()) return "a float";
  if (v.is_number()) return "an integer";
  return std::string("a ") + v.type_name();
}

class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  bool has(const char* field) const { return j_.contains(field) && !j_.at(field).is_null(); }

  const json& at(const char* field) const {
    KVPACK_CHECK(has(field), "{}: required field '{}' is missing", source_, field);
    return j_.at(field);
  }

  // Integers must be JSON integers: a fractional layer count is a broken file, not something to round.
  int64_t integer(const char* field) const {
    const json& v = at(field);
    KVPACK_CHECK(v.is_number_integer(), "{}: field '{}' must be an integer, got {} ({})", source_, field,
                 type_word(v), show(v));
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      KVPACK_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "{}: field '{}' is too large: {}",
                   source_, field, u);
      return static_cast<int64_t>(u);
    }
    return v.get<int64_t>();
  }

  // A positive size that must fit the int fields of ModelConfig.
  int size(const char* field) const {
    int64_t v = integer(field);
    KVPACK_CHECK(v > 0, "{}: field '{}' must be positive, got {}", source_, field, v);
    KVPACK_CHECK(v <= std::numeric_limits<int>::max(), "{}: field '{}' is implausibly large: {}", source_, field, v);
    return static_cast<int>(v);
  }

  int size_or(const char* field, int dflt) const { return has(field) ? size(field) : dflt; }

  double number(const char* field) const {
    const json& v = at(field);
    KVPACK_CHECK(v.is_number(), "{}: field '{}' must be a number, got {} ({})", source_, field, type_word(v), show(v));
    return v.get<double>();
  }

  double positive_number(const char* field) const {
    double v = number(field);
    KVPACK_CHECK(v > 0, "{}: field '{}' must be positive, got {}", source_, field, v);
    return v;
  }

  double number_or(const char* field, double dflt) const { return has(field) ? number(field) : dflt; }

  bool boolean_or(const char* field, bool dflt) const {
    if (!has(field)) return dflt;
    const json& v = j_.at(field);
    KVPACK_CHECK(v.is_boolean(), "{}: field '{}' must be true or false, got {} ({})", source_, field, type_word(v),
                 show(v));
    return v.get<bool>();
  }

  std::string string_or(const char* field, std::string dflt) const {
    if (!has(field)) return dflt;
    const json& v = j_.at(field);
    KVPACK_CHECK(v.is_string(), "{}: field '{}' must be a string, got {} ({})", source_, field, type_word(v), show(v));
    return v.get<std::string>();
  }

  // bos/eos: an integer, a list of integers (Llama-3.1-Instruct lists three eos ids; the first is the primary), or
  // null. -1 when absent.
  int token_id(const char* field) const {
    if (!has(field)) return -1;
    const json& v = j_.at(field);
    const json* first = &v;
    if (v.is_array()) {
      if (v.empty()) return -1;
      first = &v.front();
    }
    KVPACK_CHECK(first->is_number_integer() && first->get<int64_t>() >= 0 &&
                     first->get<int64_t>() <= std::numeric_limits<int>::max(),
                 "{}: field '{}' must be a non-negative integer token id (or a list of them), got {}", source_, field,
                 show(v));
    return static_cast<int>(first->get<int64_t>());
  }

 private:
  const json& j_;
  std::string source_;
};

int dtype_bytes(const std::string& dtype) {
  if (dtype == "bfloat16" || dtype == "float16" || dtype == "half" || dtype == "bf16" || dtype == "fp16") return 2;
  if (dtype == "float32" || dtype == "float" || dtype == "fp32") return 4;
  if (dtype.rfind("float8", 0) == 0) return 1;
  return 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVPACK_CHECK(in.good(), "{}: cannot open HF config (missing or unreadable)", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  KVPACK_CHECK(!in.bad(), "{}: error while reading HF config", path);
  return ss.str();
}

RopeScaling parse_rope_scaling(const json& v, const std::string& source) {
  RopeScaling rs;
  if (v.is_null()) return rs;
  KVPACK_CHECK(v.is_object(), "{}: field 'rope_scaling' must be an object or null, got {} ({})", source, type_word(v),
               show(v));
  Reader r(v, source + ": rope_scaling");
  // transformers >= 4.43 writes rope_type; older files write type. Either names the scheme.
  std::string type = r.string_or("rope_type", r.string_or("type", ""));
  KVPACK_CHECK(!type.empty(), "{}: field 'rope_scaling' has neither 'rope_type' nor 'type'", source);
  if (type == "default") return rs;
  if (type == "llama3") {
    rs.type = "llama3";
    rs.factor = r.positive_number("factor");
    rs.low_freq_factor = r.positive_number("low_freq_factor");
    rs.high_freq_factor = r.positive_number("high_freq_factor");
    int64_t orig = r.integer("original_max_position_embeddings");
    KVPACK_CHECK(orig > 0, "{}: rope_scaling: field 'original_max_position_embeddings' must be positive, got {}",
                 source, orig);
    rs.original_max_position_embeddings = orig;
    // The llama3 wavelength bands are [orig/high, orig/low]: low must be below high or the ramp divides by zero.
    KVPACK_CHECK(rs.low_freq_factor < rs.high_freq_factor,
                 "{}: rope_scaling: low_freq_factor ({}) must be smaller than high_freq_factor ({})", source,
                 rs.low_freq_factor, rs.high_freq_factor);
    return rs;
  }
  if (type == "linear") {
    rs.type = "linear";
    rs.factor = r.positive_number("factor");
    return rs;
  }
  fail("{}: rope_scaling type '{}' is not supported (supported: llama3, linear, default)", source, type);
}

// Name shown in tables: the repository id when the file records it, else the model directory, else the file stem.
std::string model_name(const Reader& r, const std::string& source) {
  std::string n = r.string_or("_name_or_path", "");
  if (!n.empty()) return n;
  std::filesystem::path p(source);
  if (p.filename() == "config.json" && p.has_parent_path() && !p.parent_path().filename().empty())
    return p.parent_path().filename().string();
  return p.stem().string();
}

}  // namespace

int64_t count_params(const ModelConfig& c) {
  const int64_t d = c.d_model, hd = c.head_dim, q = int64_t{c.n_heads} * hd, kv = int64_t{c.n_kv_heads} * hd;
  const int64_t embed = int64_t{c.vocab_size} * d;
  int64_t attn = d * q + 2 * d * kv + q * d;  // q, k, v, o projections
  if (c.attn_bias) attn += q + 2 * kv;         // qwen2: biases on q, k, v (not o)
  const int64_t mlp = 3 * d * int64_t{c.d_ff};  // gate, up, down
  const int64_t norms = 2 * d;                  // input and post-attention RMSNorm
  return embed + int64_t{c.n_layers} * (attn + mlp + norms) + d /* final norm */ + (c.tied_embeddings ? 0 : embed);
}

HfConfigInfo parse_hf_config(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers beyond double (1e500000)
    fail("{}: not valid JSON: {}", source, e.what());
  }
  KVPACK_CHECK(j.is_object(), "{}: an HF config must be a JSON object, got {}", source, type_word(j));
  Reader r(j, source);

  // The architecture: `architectures` names the class; older or hand-written files may only have model_type.
  std::string arch_name;
  if (r.has("architectures")) {
    const json& a = j.at("architectures");
    KVPACK_CHECK(a.is_array() && !a.empty() && a.front().is_string(),
                 "{}: field 'architectures' must be a non-empty list of strings, got {}", source, show(a));
    arch_name = a.front().get<std::string>();
  } else {
    arch_name = r.string_or("model_type", "");
    KVPACK_CHECK(!arch_name.empty(), "{}: neither 'architectures' nor 'model_type' is present", source);
  }

  ModelConfig c;
  if (arch_name == "LlamaForCausalLM" || arch_name == "llama") {
    c.arch = "llama";
    // LlamaConfig's attention_bias also adds an o_proj bias and mlp_bias adds three more; no published Llama-3 or
    // SmolLM2 checkpoint uses them and the runner has no such terms, so refuse instead of computing a wrong model.
    KVPACK_CHECK(!r.boolean_or("attention_bias", false),
                 "{}: field 'attention_bias' is true; biased Llama attention is not supported", source);
    KVPACK_CHECK(!r.boolean_or("mlp_bias", false), "{}: field 'mlp_bias' is true; biased Llama MLPs are not supported",
                 source);
  } else if (arch_name == "Qwen2ForCausalLM" || arch_name == "qwen2") {
    c.arch = "qwen2";
    c.attn_bias = true;  // Qwen2 always has q/k/v biases (o_proj has none); the config has no switch for it
    KVPACK_CHECK(!r.boolean_or("use_sliding_window", false),
                 "{}: field 'use_sliding_window' is true; sliding-window attention is not supported", source);
  } else {
    fail("{}: architecture '{}' is not supported (supported: LlamaForCausalLM, Qwen2ForCausalLM)", source, arch_name);
  }

  std::string act = r.string_or("hidden_act", "silu");
  KVPACK_CHECK(act == "silu", "{}: field 'hidden_act' is '{}'; only 'silu' (SwiGLU) is supported", source, act);

  c.d_model = r.size("hidden_size");
  c.d_ff = r.size("intermediate_size");
  c.n_layers = r.size("num_hidden_layers");
  c.n_heads = r.size("num_attention_heads");
  c.n_kv_heads = r.size_or("num_key_value_heads", c.n_heads);  // HF default: no GQA
  if (r.has("head_dim")) {
    c.head_dim = r.size("head_dim");
  } else {
    KVPACK_CHECK(c.d_model % c.n_heads == 0,
                 "{}: no 'head_dim' and hidden_size ({}) is not a multiple of num_attention_heads ({})", source,
                 c.d_model, c.n_heads);
    c.head_dim = c.d_model / c.n_heads;
  }
  c.vocab_size = r.size("vocab_size");
  c.max_context = r.size("max_position_embeddings");
  c.rope_theta = r.has("rope_theta") ? r.positive_number("rope_theta") : 10000.0;
  c.rms_eps = r.has("rms_norm_eps") ? r.positive_number("rms_norm_eps") : 1e-6;  // LlamaConfig/Qwen2Config default
  c.tied_embeddings = r.boolean_or("tie_word_embeddings", false);
  if (j.contains("rope_scaling")) c.rope_scaling = parse_rope_scaling(j.at("rope_scaling"), source);
  c.bos_token_id = r.token_id("bos_token_id");
  c.eos_token_id = r.token_id("eos_token_id");
  c.name = model_name(r, source);

  validate(c, source);
  c.n_params = count_params(c);

  HfConfigInfo info;
  info.config = std::move(c);
  // transformers >= 4.56 writes `dtype`; earlier versions `torch_dtype`.
  info.torch_dtype = r.string_or("torch_dtype", r.string_or("dtype", ""));
  info.dtype_bytes = dtype_bytes(info.torch_dtype);
  return info;
}

HfConfigInfo read_hf_config(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) file = (std::filesystem::path(path) / "config.json").string();
  return parse_hf_config(read_text(file), file);
}

ModelConfig model_config_from_hf_json(const std::string& path) { return read_hf_config(path).config; }

}  // namespace kvpack
