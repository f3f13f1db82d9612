// Rendering a Plan: an aligned table for people (every convention spelled out above it) and JSON for machines.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "kvpack/plan.h"

namespace kvpack {
namespace {

std::string grouped(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string usd(double v) { return (v < 0 ? "-$" : "$") + grouped(std::llround(std::fabs(v))); }

// Decimal units (the published figures are in GB = 1e9 bytes); MB below 1 GB so a small model's weights stay visible.
std::string gb(double bytes) {
  return std::fabs(bytes) < 1e9 ? fmt::format("{:.2f} MB", bytes / 1e6) : fmt::format("{:.2f} GB", bytes / 1e9);
}

// users/GPU is fractional under TP (group users / tp, e.g. 19 / 8 = 2.375): print it exactly, without trailing zeros.
std::string users_per_gpu(double v) {
  if (v == std::floor(v)) return grouped(static_cast<int64_t>(v));
  std::string s = fmt::format("{:.3f}", v);
  while (s.back() == '0') s.pop_back();
  return s;
}

// Left-aligned first column, the rest right-aligned, two spaces between.
std::string aligned(const std::vector<std::vector<std::string>>& cells) {
  std::vector<size_t> w;
  for (const auto& row : cells) {
    if (w.size() < row.size()) w.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  }
  std::string out;
  for (const auto& row : cells) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) line += "  ";
      line += i == 0 ? fmt::format("{:<{}}", row[i], w[i]) : fmt::format("{:>{}}", row[i], w[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

}  // namespace

std::string plan_table(const Plan& p) {
  const PlanOptions& o = p.options;
  const ModelConfig& mc = o.model.config;
  std::string s;
  s += fmt::format("{} on {} GPUs: TP {}, {} GPU{}/node ({} TP group{} per node), context {} tokens\n", mc.name,
                   o.gpu.name, o.tp, o.gpus_per_node, o.gpus_per_node == 1 ? "" : "s", p.replicas_per_node,
                   p.replicas_per_node == 1 ? "" : "s", grouped(o.context));
  s += fmt::format("  GPU memory    {} per GPU, {}\n", gb(p.gpu_memory_bytes), p.gpu_memory_basis);
  if (o.weight_bytes)
    s += fmt::format("  weights       {} (given)\n", gb(p.weight_bytes));
  else if (o.model.weight_source.rfind("params", 0) == 0)
    s += fmt::format("  weights       {} = {} {}\n", gb(p.weight_bytes), grouped(mc.n_params), o.model.weight_source);
  else
    s += fmt::format("  weights       {} = {}\n", gb(p.weight_bytes), o.model.weight_source);
  if (p.kv_budget_overridden)
    s += fmt::format("  KV budget     {} per TP group (given)\n", gb(p.kv_budget_bytes));
  else
    s += fmt::format("  KV budget     {} per TP group = {} x ({} x {} - {} activations) - {} weights\n",
                     gb(p.kv_budget_bytes), o.tp, o.mem_fraction, gb(p.gpu_memory_bytes), gb(o.activation_bytes),
                     gb(p.weight_bytes));
  s += fmt::format("  KV elements   {} per token = {} layers x {} KV heads x {} head_dim x 2 (K and V)\n",
                   grouped(p.kv_elements_per_token), mc.n_layers, mc.n_kv_heads, mc.head_dim);
  s += fmt::format("  prices        reserved {}/GPU-year (= ${:.2f}/GPU-hour), on-demand ${:.2f}/GPU-hour x {} h; GPUs "
                   "billed in whole nodes\n\n",
                   usd(o.reserved_usd_per_gpu_year), o.reserved_usd_per_gpu_year / o.hours_per_year,
                   o.on_demand_usd_per_gpu_hour, grouped(std::llround(o.hours_per_year)));

  std::vector<std::vector<std::string>> cells;
  cells.push_back({"format", "bits/elem", "KiB/token", "GB/user", "users/GPU", "users/node",
                   fmt::format("users/{} GPUs", grouped(o.fleet_gpus)), fmt::format("GPUs for {}", grouped(o.users)),
                   "nodes", "reserved $/yr", "on-demand $/yr", "saving vs fp8", "calib MB"});
  for (const auto& r : p.rows) {
    std::vector<std::string> row = {r.name,
                                    fmt::format("{:g}", r.bits_per_element),
                                    fmt::format("{:.1f}", r.kv_bytes_per_token / 1024),
                                    fmt::format("{:.2f}", r.kv_bytes_per_user / 1e9),
                                    users_per_gpu(r.users_per_gpu),
                                    grouped(r.users_per_node),
                                    grouped(r.fleet_users)};
    if (r.fits) {
      row.push_back(grouped(r.gpus_needed));
      row.push_back(grouped(r.nodes_needed));
      row.push_back(usd(r.cost_reserved_usd_per_year));
      row.push_back(usd(r.cost_on_demand_usd_per_year));
      row.push_back(r.format == Format::fp8 ? "-"
                                            : fmt::format("{} ({:.0f}%)", usd(r.saving_vs_fp8_reserved_usd_per_year),
                                                          100 * r.saving_vs_fp8_fraction));
    } else {
      for (int i = 0; i < 5; ++i) row.push_back("n/a");
    }
    row.push_back(r.calibration_bytes > 0 ? fmt::format("{:.3g}", r.calibration_bytes / 1e6) : "-");
    cells.push_back(std::move(row));
  }
  s += aligned(cells);
  s += fmt::format(
      "\nusers/GPU = users per TP group / TP size; GPUs for N users are whole TP groups, billed as whole nodes; savings "
      "are reserved $/yr against fp8 for the same users (percent of GPUs).\ncalib MB: one-off calibration file per "
      "model (estimate: fp16 head_dim^2 rotation + fp32 scales + bit allocation per layer, KV head and K/V), never per "
      "user.\n");
  for (const auto& n : p.notes) s += fmt::format("note: {}\n", n);
  return s;
}

std::string plan_json(const Plan& p) {
  using json = nlohmann::json;
  const PlanOptions& o = p.options;
  const ModelConfig& mc = o.model.config;
  json formats = json::array();
  for (const auto& r : p.rows) {
    // Fields that only exist when a user fits are null otherwise (never a fake 0 GPUs / $0).
    auto when_fits = [&](auto v) -> json { return r.fits ? json(v) : json(nullptr); };
    formats.push_back({
        {"format", r.name},
        {"bits_per_element", r.bits_per_element},
        {"sink_tokens", r.sink_tokens},
        {"kv_bytes_per_token", r.kv_bytes_per_token},
        {"sink_overhead_bytes_per_user", r.sink_overhead_bytes},
        {"kv_bytes_per_user", r.kv_bytes_per_user},
        {"users_per_tp_group", r.users_per_replica},
        {"users_per_gpu", r.users_per_gpu},
        {"users_per_node", r.users_per_node},
        {"fleet_users", r.fleet_users},
        {"fits", r.fits},
        {"tp_groups_needed", when_fits(r.replicas_needed)},
        {"gpus_needed", when_fits(r.gpus_needed)},
        {"nodes_needed", when_fits(r.nodes_needed)},
        {"gpus_billed", when_fits(r.gpus_billed)},
        {"cost_reserved_usd_per_year", when_fits(r.cost_reserved_usd_per_year)},
        {"cost_on_demand_usd_per_year", when_fits(r.cost_on_demand_usd_per_year)},
        {"reserved_usd_per_user_year", when_fits(r.reserved_usd_per_user_year)},
        {"saving_vs_fp8_reserved_usd_per_year", when_fits(r.saving_vs_fp8_reserved_usd_per_year)},
        {"saving_vs_fp8_on_demand_usd_per_year", when_fits(r.saving_vs_fp8_on_demand_usd_per_year)},
        {"saving_vs_fp8_fraction", when_fits(r.saving_vs_fp8_fraction)},
        {"calibration_file_bytes_estimate", r.calibration_bytes},
    });
  }
  json out = {
      {"model",
       {{"name", mc.name},
        {"source", o.model.source},
        {"n_layers", mc.n_layers},
        {"n_kv_heads", mc.n_kv_heads},
        {"head_dim", mc.head_dim},
        {"max_context", mc.max_context},
        {"n_params", mc.n_params},
        {"kv_elements_per_token", p.kv_elements_per_token},
        {"weight_bytes", p.weight_bytes},
        {"weight_source", o.weight_bytes ? std::string("given") : o.model.weight_source}}},
      {"gpu",
       {{"key", o.gpu.key},
        {"name", o.gpu.name},
        {"memory_bytes", p.gpu_memory_bytes},
        {"memory_basis", p.gpu_memory_basis},
        {"memory_convention", memory_convention_name(o.convention)},
        {"nominal_bytes", o.gpu.nominal_bytes},
        {"reported_bytes", o.gpu.reported_bytes}}},
      {"tp", o.tp},
      {"gpus_per_node", o.gpus_per_node},
      {"tp_groups_per_node", p.replicas_per_node},
      {"kv_head_replication", p.kv_replication},
      {"context", o.context},
      {"users", o.users},
      {"fleet_gpus", o.fleet_gpus},
      {"mem_fraction", o.mem_fraction},
      {"activation_bytes_per_gpu", o.activation_bytes},
      {"kv_budget_bytes", p.kv_budget_bytes},
      {"kv_budget_overridden", p.kv_budget_overridden},
      {"prices",
       {{"reserved_usd_per_gpu_year", o.reserved_usd_per_gpu_year},
        {"reserved_usd_per_gpu_hour", o.reserved_usd_per_gpu_year / o.hours_per_year},
        {"on_demand_usd_per_gpu_hour", o.on_demand_usd_per_gpu_hour},
        {"hours_per_year", o.hours_per_year}}},
      {"formats", formats},
      {"notes", p.notes},
  };
  return out.dump(2);
}

}  // namespace kvpack
