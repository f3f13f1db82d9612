// Capacity and cost planner: bits per element -> concurrent users per GPU/node, GPUs for N users, dollars per year.
//
// Memory rule (every term overridable):
//   KV budget per TP group = tp x (mem_fraction x GPU memory - activation bytes) - weight bytes
// One TP group holds one copy of the weights (split across its GPUs) and serves `users_per_replica` sequences of
// `context` tokens each: users_per_replica = floor(KV budget / KV bytes per user). "Per GPU" under TP is
// users_per_replica / tp (each GPU holds 1/tp of every user's K/V, as the KV heads are split across the group).
// See docs/PLANNER.md for the conventions, in particular which GPU memory figure reproduces the published numbers.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvpack/formats.h"
#include "kvpack/model_config.h"

namespace kvpack {

// ---- GPUs

struct GpuSpec {
  std::string key;                // preset key: "h100-80gb", "h200-141gb", or "custom"
  std::string name;               // "H100 SXM 80 GB"
  double nominal_bytes = 0;       // spec-sheet capacity in decimal bytes (80 GB = 80e9)
  double reported_bytes = 0;      // nvidia-smi memory.total in bytes (H100 80 GB: 81,559 MiB; H200: 143,771 MiB)
  int default_gpus_per_node = 8;  // HGX boards carry 8
};

std::span<const GpuSpec> gpu_presets();
// Throws kvpack::Error listing the presets when `key` is unknown.
const GpuSpec& gpu_preset(std::string_view key);

// Which capacity figure stands for "GPU memory".
//   reported:  nvidia-smi's memory.total (81,559 MiB on an H100 80 GB), the figure operators read off the machine.
//   nominal:   the spec-sheet figure (80e9 bytes), ~6.5% lower: the conservative one.
//   published: reported for a single-GPU replica (tp 1), nominal for a tensor-parallel group (tp > 1). This is the
//              pair of conventions under which both published H100 figures (8B: 58.6 GB, 70B TP8: 416 GB)
//              reproduce; it is the default so that the documented figures come out of the default command.
enum class MemoryConvention { published, reported, nominal };
std::string_view memory_convention_name(MemoryConvention c);
MemoryConvention parse_memory_convention(std::string_view s);  // throws on unknown names

// ---- models

struct ModelSpec {
  ModelConfig config;
  double weight_bytes = 0;    // all weights of one model copy (a TP group holds exactly one)
  std::string weight_source;  // how weight_bytes was obtained, for the table and JSON
  std::string source;         // preset key or file path
};

// Built-in presets: "llama-3.1-8b", "llama-3.1-70b", "smollm2-135m" (their published HF config.json, embedded).
std::span<const std::string_view> model_preset_keys();
// A preset key, an HF config.json (or a directory holding one), or a .gguf file. Throws kvpack::Error for unknown
// presets, unreadable/invalid files, and HF configs whose dtype gives no weight size (pass weight bytes instead).
ModelSpec load_model_spec(const std::string& preset_or_path);

// ---- calibration file size (a per-model one-off, never per user)

// ESTIMATE until the calibration file format is final: per (layer, kv head, K/V) a calibrated kvpack format stores a
// head_dim x head_dim fp16 rotation, head_dim fp32 scales and a head_dim-byte bit allocation; fp8 stores one fp32
// scale; uncalibrated formats need no file. Returned in bytes.
double calibration_bytes_estimate(const ModelConfig& c, Format f);

// ---- the plan

struct PlanOptions {
  ModelSpec model;
  GpuSpec gpu;
  MemoryConvention convention = MemoryConvention::published;
  std::optional<double> gpu_memory_bytes;  // explicit per-GPU memory; replaces the preset's figure
  int tp = 1;                              // tensor-parallel size: GPUs holding one model copy
  int gpus_per_node = 8;
  int64_t context = 131072;                // tokens per user (sequence)
  int64_t users = 1000;                    // target concurrent users for the GPU/cost columns
  int64_t fleet_gpus = 1000;               // a fleet size for the "users on N GPUs" figure
  double mem_fraction = 0.92;
  double activation_bytes = 4e9;           // per GPU
  std::optional<double> weight_bytes;      // replaces model.weight_bytes
  std::optional<double> kv_budget_bytes;   // per TP group; replaces the memory rule entirely
  std::vector<Format> formats;             // empty: every registry format
  double reserved_usd_per_gpu_year = 17500;
  double on_demand_usd_per_gpu_hour = 3.61;
  double hours_per_year = 8760;
};

struct FormatPlan {
  Format format;
  std::string name;
  double bits_per_element = 0;     // from the registry (per-token metadata included)
  int sink_tokens = 0;             // from the registry
  double kv_bytes_per_token = 0;   // over all layers, K and V, every TP rank together
  double sink_overhead_bytes = 0;  // per user: sink tokens in bf16 instead of `bits`
  double kv_bytes_per_user = 0;    // context x per token + sink overhead (x KV-head replication when tp > kv heads)
  int64_t users_per_replica = 0;   // floor(budget / bytes per user): sequences one TP group serves
  bool fits = false;               // users_per_replica >= 1; when false the GPU and cost fields are 0 (JSON: null)
  double users_per_gpu = 0;        // users_per_replica / tp
  int64_t users_per_node = 0;      // users_per_replica x replicas per node
  int64_t fleet_users = 0;         // users on options.fleet_gpus GPUs (whole replicas only)
  int64_t replicas_needed = 0;     // for options.users
  int64_t gpus_needed = 0;         // replicas_needed x tp
  int64_t nodes_needed = 0;        // GPUs counted in whole nodes
  int64_t gpus_billed = 0;         // nodes_needed x gpus_per_node: what is paid for
  double cost_reserved_usd_per_year = 0;
  double cost_on_demand_usd_per_year = 0;
  double reserved_usd_per_user_year = 0;  // reserved GPU-year / users_per_gpu (marginal cost of one user)
  double saving_vs_fp8_reserved_usd_per_year = 0;  // fp8's cost minus this format's, same users
  double saving_vs_fp8_on_demand_usd_per_year = 0;
  double saving_vs_fp8_fraction = 0;               // 1 - gpus_billed / fp8 gpus_billed
  double calibration_bytes = 0;    // one-off per model (estimate, see calibration_bytes_estimate)
};

struct Plan {
  PlanOptions options;
  double weight_bytes = 0;           // as used (override applied)
  double gpu_memory_bytes = 0;       // per GPU, as used
  std::string gpu_memory_basis;      // "reported (81,559 MiB)", "nominal (80 GB)", "explicit"
  bool kv_budget_overridden = false;
  double kv_budget_bytes = 0;        // per TP group (replica)
  int replicas_per_node = 0;
  int kv_replication = 1;            // tp / n_kv_heads when tp exceeds the KV heads (each head copied), else 1
  int64_t kv_elements_per_token = 0;
  std::vector<FormatPlan> rows;
  std::vector<std::string> notes;    // warnings worth reading (context beyond the model's maximum, ...)

  const FormatPlan& row(Format f) const;  // throws if f was not planned
};

// Throws kvpack::Error for non-positive sizes, a TP size that does not divide the node or the KV heads, a model that
// does not fit, and similar.
Plan make_plan(const PlanOptions& o);

std::string plan_table(const Plan& p);  // aligned human-readable table with the conventions spelled out
std::string plan_json(const Plan& p);   // {"model":..., "gpu":..., "formats":[{format, bits_per_element, ...}]}

}  // namespace kvpack
