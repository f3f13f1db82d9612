// `kvpack plan`: users per GPU/node, GPUs for N users and yearly cost for every KV format (see docs/PLANNER.md).
#include <fmt/format.h>

#include <memory>
#include <optional>

#include "command.h"
#include "kvpack/error.h"
#include "kvpack/plan.h"

namespace {

struct Args {
  std::string model, gpu, convention = "published", formats = "all";
  std::optional<double> gpu_memory_gb, gpu_memory_mib, weight_bytes, kv_budget_gb;
  std::optional<int> gpus_per_node;
  int tp = 1;
  int64_t context = 131072, users = 1000, fleet_gpus = 1000;
  double mem_fraction = 0.92, activation_gb = 4.0;
  double reserved_year = 17500, on_demand_hour = 3.61, hours_per_year = 8760;
  bool json = false;
};

std::string model_help() {
  std::string keys;
  for (auto k : kvpack::model_preset_keys()) keys += (keys.empty() ? "" : ", ") + std::string(k);
  return "Model: a preset (" + keys + "), an HF config.json (or its directory), or a .gguf file";
}

std::string gpu_help() {
  std::string keys;
  for (const auto& g : kvpack::gpu_presets()) keys += (keys.empty() ? "" : ", ") + g.key;
  return "GPU preset (" + keys + "); default h100-80gb unless --gpu-memory-gb/--gpu-memory-mib describe a custom GPU";
}

kvpack::cli::Runner setup(CLI::App* app) {
  auto a = std::make_shared<Args>();
  app->add_option("--model", a->model, model_help())->required();
  app->add_option("--gpu", a->gpu, gpu_help());
  app->add_option("--gpu-memory-gb", a->gpu_memory_gb, "Explicit GPU memory in GB (1e9 bytes), overrides the preset");
  app->add_option("--gpu-memory-mib", a->gpu_memory_mib, "Explicit GPU memory in MiB (as nvidia-smi prints it)");
  app->add_option("--memory-convention", a->convention,
                  "Preset memory figure: published (reported for TP 1, nominal for TP > 1), reported, nominal")
      ->capture_default_str();
  app->add_option("--tp", a->tp, "Tensor-parallel size: GPUs holding one model copy")->capture_default_str();
  app->add_option("--gpus-per-node", a->gpus_per_node, "GPUs per node (default: the preset's, 8)");
  app->add_option("--context", a->context, "Tokens per user")->capture_default_str();
  app->add_option("--users", a->users, "Concurrent users to provision GPUs and cost for")->capture_default_str();
  app->add_option("--fleet-gpus", a->fleet_gpus, "Fleet size for the users-on-N-GPUs column")->capture_default_str();
  app->add_option("--formats", a->formats, "Formats to plan, e.g. fp8,int4,q4,q3.5 (or all)")->capture_default_str();
  app->add_option("--mem-fraction", a->mem_fraction, "Fraction of GPU memory the server may use")->capture_default_str();
  app->add_option("--activation-gb", a->activation_gb, "Activation memory per GPU in GB")->capture_default_str();
  app->add_option("--weight-bytes", a->weight_bytes, "Weight bytes of one model copy (overrides the model's)");
  app->add_option("--kv-budget-gb", a->kv_budget_gb, "KV budget per TP group in GB (overrides the memory rule)");
  app->add_option("--reserved-usd-per-gpu-year", a->reserved_year, "Reserved price")->capture_default_str();
  app->add_option("--on-demand-usd-per-gpu-hour", a->on_demand_hour, "On-demand price")->capture_default_str();
  app->add_option("--hours-per-year", a->hours_per_year, "Hours billed per year on demand")->capture_default_str();
  app->add_flag("--json", a->json, "Print JSON instead of a table");

  return [a] {
    kvpack::PlanOptions o;
    o.model = kvpack::load_model_spec(a->model);
    KVPACK_CHECK(!(a->gpu_memory_gb && a->gpu_memory_mib), "give --gpu-memory-gb or --gpu-memory-mib, not both");
    std::optional<double> mem;
    if (a->gpu_memory_gb) mem = *a->gpu_memory_gb * 1e9;
    if (a->gpu_memory_mib) mem = *a->gpu_memory_mib * 1024.0 * 1024.0;
    if (!a->gpu.empty() || !mem) {
      o.gpu = kvpack::gpu_preset(a->gpu.empty() ? "h100-80gb" : a->gpu);
    } else {
      o.gpu = kvpack::GpuSpec{"custom", fmt::format("custom {:g} GB", *mem / 1e9), *mem, *mem, 8};
    }
    o.gpu_memory_bytes = mem;
    o.convention = kvpack::parse_memory_convention(a->convention);
    o.tp = a->tp;
    o.gpus_per_node = a->gpus_per_node.value_or(o.gpu.default_gpus_per_node);
    o.context = a->context;
    o.users = a->users;
    o.fleet_gpus = a->fleet_gpus;
    o.mem_fraction = a->mem_fraction;
    o.activation_bytes = a->activation_gb * 1e9;
    o.weight_bytes = a->weight_bytes;
    if (a->kv_budget_gb) o.kv_budget_bytes = *a->kv_budget_gb * 1e9;
    o.formats = kvpack::parse_format_list(a->formats);
    o.reserved_usd_per_gpu_year = a->reserved_year;
    o.on_demand_usd_per_gpu_hour = a->on_demand_hour;
    o.hours_per_year = a->hours_per_year;
    kvpack::Plan p = kvpack::make_plan(o);
    if (a->json)
      fmt::print("{}\n", kvpack::plan_json(p));
    else
      fmt::print("{}", kvpack::plan_table(p));
    return 0;
  };
}

const bool registered =
    kvpack::cli::register_command("plan", "Users per GPU, GPUs and yearly cost for each KV format", setup);

}  // namespace
