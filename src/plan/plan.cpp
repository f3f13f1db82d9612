// The planner's arithmetic. Bits per element and sink tokens come only from the format registry (formats.h); this
// file owns the memory rule, the TP accounting, the calibration-size estimate and the cost arithmetic.
#include "kvpack/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kvpack/error.h"

namespace kvpack {
namespace {

// Sink tokens are stored in bf16 whatever the format.
constexpr double kSinkBits = 16.0;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

double calibration_bytes_estimate(const ModelConfig& c, Format f) {
  const FormatInfo& info = format_info(f);
  if (!info.calibrated) return 0;
  const double units = 2.0 * c.n_layers * c.n_kv_heads;  // one parameter set per (layer, kv head, K/V)
  const double d = c.head_dim;
  // fp8 is the only calibrated baseline: a static fp32 scale per unit and nothing else.
  if (info.baseline) return units * 4;
  // kvpack formats: fp16 rotation (d x d) + fp32 per-channel scales (d) + one byte of bit allocation per channel (d).
  return units * (d * d * 2 + d * 4 + d);
}

const FormatPlan& Plan::row(Format f) const {
  for (const auto& r : rows)
    if (r.format == f) return r;
  fail("format '{}' is not in this plan", format_name(f));
}

Plan make_plan(const PlanOptions& o) {
  const ModelConfig& mc = o.model.config;
  const std::string& src = o.model.source.empty() ? mc.name : o.model.source;
  validate(mc, src);
  KVPACK_CHECK(o.tp >= 1, "--tp must be a positive number of GPUs, got {}", o.tp);
  KVPACK_CHECK(o.gpus_per_node >= 1, "--gpus-per-node must be positive, got {}", o.gpus_per_node);
  KVPACK_CHECK(o.gpus_per_node % o.tp == 0,
               "--tp {} does not divide a node of {} GPUs (a TP group must fit whole in one node)", o.tp,
               o.gpus_per_node);
  KVPACK_CHECK(o.context >= 1, "--context must be a positive number of tokens, got {}", o.context);
  KVPACK_CHECK(o.users >= 1, "--users must be positive, got {}", o.users);
  KVPACK_CHECK(o.fleet_gpus >= 0, "--fleet-gpus must not be negative, got {}", o.fleet_gpus);
  KVPACK_CHECK(o.mem_fraction > 0 && o.mem_fraction <= 1, "--mem-fraction must be in (0, 1], got {}", o.mem_fraction);
  KVPACK_CHECK(o.activation_bytes >= 0 && std::isfinite(o.activation_bytes),
               "--activation-gb must not be negative, got {} GB", o.activation_bytes / 1e9);
  KVPACK_CHECK(o.reserved_usd_per_gpu_year >= 0 && o.on_demand_usd_per_gpu_hour >= 0,
               "prices must not be negative (reserved ${}/GPU-year, on-demand ${}/GPU-hour)",
               o.reserved_usd_per_gpu_year, o.on_demand_usd_per_gpu_hour);
  KVPACK_CHECK(o.hours_per_year > 0, "hours per year must be positive, got {}", o.hours_per_year);

  // Under TP the KV heads are split across the group; with more ranks than KV heads each head is copied
  // tp / n_kv_heads times (as vLLM and TensorRT-LLM do), which multiplies the KV bytes per user.
  const int nkv = mc.n_kv_heads;
  KVPACK_CHECK(nkv % o.tp == 0 || o.tp % nkv == 0,
               "{}: --tp {} neither divides nor is a multiple of the model's {} KV heads", src, o.tp, nkv);

  Plan p;
  p.options = o;
  p.kv_replication = o.tp > nkv ? o.tp / nkv : 1;
  p.replicas_per_node = o.gpus_per_node / o.tp;
  p.kv_elements_per_token = mc.kv_elements_per_token();
  p.weight_bytes = o.weight_bytes ? *o.weight_bytes : o.model.weight_bytes;
  KVPACK_CHECK(p.weight_bytes >= 0 && std::isfinite(p.weight_bytes),
               "{}: weight size must not be negative, got {} bytes", src, p.weight_bytes);

  // GPU memory: an explicit figure wins; otherwise the convention picks the preset's reported or nominal capacity.
  if (o.gpu_memory_bytes) {
    p.gpu_memory_bytes = *o.gpu_memory_bytes;
    p.gpu_memory_basis = "explicit";
  } else {
    bool reported = o.convention == MemoryConvention::reported ||
                    (o.convention == MemoryConvention::published && o.tp == 1);
    if (reported && o.gpu.reported_bytes > 0) {
      p.gpu_memory_bytes = o.gpu.reported_bytes;
      p.gpu_memory_basis = fmt::format("reported ({:.0f} MiB, nvidia-smi memory.total)", o.gpu.reported_bytes / (1 << 20));
    } else {
      p.gpu_memory_bytes = o.gpu.nominal_bytes;
      p.gpu_memory_basis = fmt::format("nominal ({:g} GB spec sheet)", o.gpu.nominal_bytes / 1e9);
    }
  }
  KVPACK_CHECK(p.gpu_memory_bytes > 0 && std::isfinite(p.gpu_memory_bytes),
               "GPU memory must be positive, got {} GB (GPU '{}')", p.gpu_memory_bytes / 1e9, o.gpu.key);

  if (o.kv_budget_bytes) {
    p.kv_budget_bytes = *o.kv_budget_bytes;
    p.kv_budget_overridden = true;
    KVPACK_CHECK(p.kv_budget_bytes > 0 && std::isfinite(p.kv_budget_bytes), "--kv-budget-gb must be positive, got {}",
                 p.kv_budget_bytes / 1e9);
  } else {
    const double usable_per_gpu = o.mem_fraction * p.gpu_memory_bytes - o.activation_bytes;
    p.kv_budget_bytes = o.tp * usable_per_gpu - p.weight_bytes;
    KVPACK_CHECK(p.kv_budget_bytes > 0,
                 "{}: does not fit: {:.2f} GB of weights on {} x {} leaves no KV memory ({} x ({} x {:.2f} GB - {:.2f} "
                 "GB activations) - {:.2f} GB = {:.2f} GB); use a larger --tp or a bigger GPU",
                 mc.name, p.weight_bytes / 1e9, o.tp, o.gpu.name, o.tp, o.mem_fraction, p.gpu_memory_bytes / 1e9,
                 o.activation_bytes / 1e9, p.weight_bytes / 1e9, p.kv_budget_bytes / 1e9);
  }

  if (o.context > mc.max_context)
    p.notes.push_back(fmt::format("context {} exceeds {}'s maximum of {} tokens", o.context, mc.name, mc.max_context));
  if (p.kv_replication > 1)
    p.notes.push_back(fmt::format("TP {} exceeds the {} KV heads: each KV head is stored on {} GPUs", o.tp, nkv,
                                  p.kv_replication));

  // Every format is computed (fp8 is the reference for savings even when not asked for); rows keep the asked order.
  auto compute = [&](const FormatInfo& f) {
    FormatPlan r;
    r.format = f.id;
    r.name = std::string(f.name);
    r.bits_per_element = f.bits_per_element;
    r.sink_tokens = f.sink_tokens;
    const double elems = static_cast<double>(p.kv_elements_per_token);
    r.kv_bytes_per_token = elems * f.bits_per_element / 8;
    const double sinks = static_cast<double>(std::min<int64_t>(f.sink_tokens, o.context));
    r.sink_overhead_bytes = sinks * elems * std::max(0.0, kSinkBits - f.bits_per_element) / 8;
    // Whole bytes: a sequence's cache cannot end in a fraction of a byte.
    r.kv_bytes_per_user =
        std::ceil(static_cast<double>(o.context) * r.kv_bytes_per_token + r.sink_overhead_bytes) * p.kv_replication;
    r.users_per_replica = static_cast<int64_t>(std::floor(p.kv_budget_bytes / r.kv_bytes_per_user));
    r.fits = r.users_per_replica >= 1;
    r.users_per_gpu = static_cast<double>(r.users_per_replica) / o.tp;
    r.users_per_node = r.users_per_replica * p.replicas_per_node;
    r.fleet_users = (o.fleet_gpus / o.tp) * r.users_per_replica;
    r.calibration_bytes = calibration_bytes_estimate(mc, f.id);
    if (r.fits) {
      r.replicas_needed = ceil_div(o.users, r.users_per_replica);
      r.gpus_needed = r.replicas_needed * o.tp;
      r.nodes_needed = ceil_div(r.gpus_needed, o.gpus_per_node);
      r.gpus_billed = r.nodes_needed * o.gpus_per_node;
      r.cost_reserved_usd_per_year = static_cast<double>(r.gpus_billed) * o.reserved_usd_per_gpu_year;
      r.cost_on_demand_usd_per_year =
          static_cast<double>(r.gpus_billed) * o.on_demand_usd_per_gpu_hour * o.hours_per_year;
      r.reserved_usd_per_user_year = o.reserved_usd_per_gpu_year / r.users_per_gpu;
    }
    return r;
  };

  const FormatPlan fp8 = compute(format_info(Format::fp8));
  std::vector<Format> wanted = o.formats;
  if (wanted.empty())
    for (const auto& f : all_formats()) wanted.push_back(f.id);
  for (Format f : wanted) {
    FormatPlan r = compute(format_info(f));
    if (r.fits && fp8.fits) {
      r.saving_vs_fp8_reserved_usd_per_year = fp8.cost_reserved_usd_per_year - r.cost_reserved_usd_per_year;
      r.saving_vs_fp8_on_demand_usd_per_year = fp8.cost_on_demand_usd_per_year - r.cost_on_demand_usd_per_year;
      r.saving_vs_fp8_fraction = 1.0 - static_cast<double>(r.gpus_billed) / static_cast<double>(fp8.gpus_billed);
    }
    if (!r.fits)
      p.notes.push_back(fmt::format("{}: one user of {} tokens ({:.2f} GB) does not fit the {:.2f} GB KV budget",
                                    r.name, o.context, r.kv_bytes_per_user / 1e9, p.kv_budget_bytes / 1e9));
    p.rows.push_back(std::move(r));
  }
  return p;
}

}  // namespace kvpack
