// The capacity planner: the published H100 figures (exactly, through the library and through `kvpack plan --json`),
// the 1,000-GPU fleet, cost arithmetic, TP accounting, and clear errors for bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>

#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "cli_run.h"
#include "kvpack/error.h"
#include "kvpack/hf_config.h"
#include "kvpack/plan.h"

using namespace kvpack;
using json = nlohmann::json;

namespace {

std::string hf(const std::string& name) { return std::string(KVPACK_TEST_DATA) + "/hf/" + name; }

PlanOptions options(const std::string& model, const std::string& gpu, int tp) {
  PlanOptions o;
  o.model = load_model_spec(model);
  o.gpu = gpu_preset(gpu);
  o.tp = tp;
  o.gpus_per_node = 8;
  o.context = 131072;
  return o;
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected kvpack::Error containing '" << parts.front() << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

using kvpack::test::CliResult;
using kvpack::test::run_cli;

std::map<std::string, json> rows_by_format(const json& j) {
  std::map<std::string, json> m;
  for (const auto& r : j.at("formats")) m[r.at("format").get<std::string>()] = r;
  return m;
}

}  // namespace

// ---- the published figures

TEST(Plan, Published8BOnOneH100) {
  Plan p = make_plan(options("llama-3.1-8b", "h100-80gb", 1));
  // 0.92 x 81,559 MiB - 8,030,261,248 x 2 bytes - 4e9 = 58,618,622,689.28 bytes: the published "58.6 GB".
  EXPECT_DOUBLE_EQ(p.gpu_memory_bytes, 81559.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(p.weight_bytes, 16060522496.0);
  EXPECT_NEAR(p.kv_budget_bytes, 58618622689.28, 1e-2);
  EXPECT_EQ(std::round(p.kv_budget_bytes / 1e8) / 10, 58.6);
  EXPECT_EQ(p.kv_elements_per_token, 65536);
  EXPECT_EQ(p.row(Format::fp8).users_per_replica, 6);
  EXPECT_EQ(p.row(Format::int4).users_per_replica, 12);
  EXPECT_EQ(p.row(Format::q4).users_per_replica, 13);
  EXPECT_EQ(p.row(Format::q3_5).users_per_replica, 15);
  EXPECT_EQ(p.row(Format::fp8).users_per_gpu, 6.0);
  EXPECT_EQ(p.row(Format::q3_5).users_per_gpu, 15.0);
  EXPECT_EQ(p.row(Format::q3_5).users_per_node, 15 * 8);
  // Exact bytes: fp8 = 131,072 x 65,536 x 1; q4 adds 4 bf16 sink tokens: 4 x 65,536 x (16 - 4) / 8 = 393,216.
  EXPECT_EQ(p.row(Format::fp8).kv_bytes_per_user, 8589934592.0);
  EXPECT_EQ(p.row(Format::q4).sink_overhead_bytes, 393216.0);
  EXPECT_EQ(p.row(Format::q4).kv_bytes_per_user, 4294967296.0 + 393216.0);
  EXPECT_EQ(p.row(Format::int4).kv_bytes_per_token, 36864.0);
}

TEST(Plan, Published70BOnAnH100Node) {
  Plan p = make_plan(options("llama-3.1-70b", "h100-80gb", 8));
  // 8 x (0.92 x 80e9 - 4e9) - 70,553,706,496 x 2 = 415,692,587,008 bytes: the published "416 GB".
  EXPECT_DOUBLE_EQ(p.gpu_memory_bytes, 80e9);
  EXPECT_NEAR(p.kv_budget_bytes, 415692587008.0, 1e-3);
  EXPECT_EQ(std::llround(p.kv_budget_bytes / 1e9), 416);
  EXPECT_EQ(p.kv_elements_per_token, 163840);
  EXPECT_EQ(p.replicas_per_node, 1);
  const std::map<Format, int64_t> want = {{Format::fp8, 19}, {Format::int4, 34}, {Format::q4, 38}, {Format::q3_5, 44}};
  for (auto [f, users] : want) {
    SCOPED_TRACE(std::string(format_name(f)));
    EXPECT_EQ(p.row(f).users_per_node, users);
    EXPECT_EQ(p.row(f).users_per_replica, users);
    EXPECT_DOUBLE_EQ(p.row(f).users_per_gpu, users / 8.0);  // per GPU under TP 8: the node's users / 8
  }
}

TEST(Plan, PublishedFiguresDependOnTheMemoryConvention) {
  // Neither memory figure alone reproduces both published results: that is why `published` picks per TP size.
  PlanOptions o8 = options("llama-3.1-8b", "h100-80gb", 1);
  o8.convention = MemoryConvention::nominal;
  Plan p8 = make_plan(o8);
  EXPECT_DOUBLE_EQ(p8.gpu_memory_bytes, 80e9);
  EXPECT_EQ(p8.row(Format::int4).users_per_replica, 11);  // published: 12
  PlanOptions o70 = options("llama-3.1-70b", "h100-80gb", 8);
  o70.convention = MemoryConvention::reported;
  Plan p70 = make_plan(o70);
  EXPECT_EQ(p70.row(Format::fp8).users_per_node, 21);  // published: 19
  // An explicit figure wins over every convention.
  o70.gpu_memory_bytes = 80e9;
  EXPECT_EQ(make_plan(o70).row(Format::fp8).users_per_node, 19);
  EXPECT_EQ(make_plan(o70).gpu_memory_basis, "explicit");
}

TEST(Plan, FleetOf1000Gpus) {
  PlanOptions o = options("llama-3.1-8b", "h100-80gb", 1);
  o.fleet_gpus = 1000;
  Plan p = make_plan(o);
  EXPECT_EQ(p.row(Format::fp8).fleet_users, 6000);
  EXPECT_EQ(p.row(Format::q3_5).fleet_users, 15000);
  // Under TP 8 a 1,000-GPU fleet is 125 nodes of 19 fp8 users.
  PlanOptions o70 = options("llama-3.1-70b", "h100-80gb", 8);
  o70.fleet_gpus = 1000;
  EXPECT_EQ(make_plan(o70).row(Format::fp8).fleet_users, 125 * 19);
}

// ---- cost arithmetic

TEST(Plan, CostArithmetic) {
  PlanOptions o = options("llama-3.1-8b", "h100-80gb", 1);
  o.users = 1000;
  Plan p = make_plan(o);
  const FormatPlan& fp8 = p.row(Format::fp8);
  // 1,000 users / 6 per GPU -> 167 GPUs -> 21 nodes -> 168 GPUs billed.
  EXPECT_EQ(fp8.replicas_needed, 167);
  EXPECT_EQ(fp8.gpus_needed, 167);
  EXPECT_EQ(fp8.nodes_needed, 21);
  EXPECT_EQ(fp8.gpus_billed, 168);
  EXPECT_DOUBLE_EQ(fp8.cost_reserved_usd_per_year, 168 * 17500.0);
  EXPECT_NEAR(fp8.cost_on_demand_usd_per_year, 168 * 3.61 * 8760, 1e-6);  // $5,312,764.80
  EXPECT_DOUBLE_EQ(fp8.saving_vs_fp8_reserved_usd_per_year, 0.0);
  EXPECT_NEAR(fp8.reserved_usd_per_user_year, 17500.0 / 6, 1e-9);
  // q3.5: 1,000 / 15 -> 67 GPUs -> 9 nodes -> 72 GPUs: saves 96 GPUs against fp8.
  const FormatPlan& q35 = p.row(Format::q3_5);
  EXPECT_EQ(q35.gpus_needed, 67);
  EXPECT_EQ(q35.nodes_needed, 9);
  EXPECT_EQ(q35.gpus_billed, 72);
  EXPECT_DOUBLE_EQ(q35.cost_reserved_usd_per_year, 1260000.0);
  EXPECT_DOUBLE_EQ(q35.saving_vs_fp8_reserved_usd_per_year, 96 * 17500.0);
  EXPECT_NEAR(q35.saving_vs_fp8_on_demand_usd_per_year, 96 * 3.61 * 8760, 1e-6);
  EXPECT_NEAR(q35.saving_vs_fp8_fraction, 1.0 - 72.0 / 168.0, 1e-12);

  // Billing single GPUs (gpus_per_node 1) and other prices.
  o.gpus_per_node = 1;
  o.reserved_usd_per_gpu_year = 10000;
  o.on_demand_usd_per_gpu_hour = 1.5;
  o.hours_per_year = 8000;
  Plan q = make_plan(o);
  EXPECT_EQ(q.row(Format::fp8).gpus_billed, 167);
  EXPECT_DOUBLE_EQ(q.row(Format::fp8).cost_reserved_usd_per_year, 1670000.0);
  EXPECT_DOUBLE_EQ(q.row(Format::fp8).cost_on_demand_usd_per_year, 167 * 1.5 * 8000);

  // TP 8: 1,000 users / 19 per node -> 53 nodes = 424 GPUs.
  PlanOptions o70 = options("llama-3.1-70b", "h100-80gb", 8);
  o70.users = 1000;
  Plan p70 = make_plan(o70);
  EXPECT_EQ(p70.row(Format::fp8).replicas_needed, 53);
  EXPECT_EQ(p70.row(Format::fp8).gpus_billed, 424);
  EXPECT_EQ(p70.row(Format::q3_5).gpus_billed, 23 * 8);  // ceil(1000 / 44) = 23 nodes
}

TEST(Plan, SavingAgainstFp8EvenWhenFp8IsNotListed) {
  PlanOptions o = options("llama-3.1-8b", "h100-80gb", 1);
  o.formats = parse_format_list("q3.5");
  Plan p = make_plan(o);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_DOUBLE_EQ(p.rows[0].saving_vs_fp8_reserved_usd_per_year, 96 * 17500.0);
  expect_error([&] { p.row(Format::fp8); }, {"fp8", "not in this plan"});
}

// ---- registry is the one source of truth

TEST(Plan, BitsAndSinksComeFromTheRegistry) {
  Plan p = make_plan(options("smollm2-135m", "h200-141gb", 1));
  ASSERT_EQ(p.rows.size(), all_formats().size());
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const FormatInfo& f = all_formats()[i];
    const FormatPlan& r = p.rows[i];
    EXPECT_EQ(r.name, f.name);
    EXPECT_EQ(r.bits_per_element, f.bits_per_element);
    EXPECT_EQ(r.sink_tokens, f.sink_tokens);
    EXPECT_DOUBLE_EQ(r.kv_bytes_per_token, 11520 * f.bits_per_element / 8);  // 30 x 3 x 64 x 2 elements
    EXPECT_DOUBLE_EQ(r.sink_overhead_bytes, f.sink_tokens * 11520 * std::max(0.0, 16 - f.bits_per_element) / 8);
    EXPECT_EQ(r.calibration_bytes > 0, f.calibrated);
  }
}

TEST(Plan, CalibrationEstimateIsPerModel) {
  ModelConfig c = load_model_spec("llama-3.1-8b").config;
  // 32 layers x 8 KV heads x 2 (K/V) = 512 units of (128^2 x 2 + 128 x 4 + 128) bytes.
  EXPECT_DOUBLE_EQ(calibration_bytes_estimate(c, Format::q4), 512.0 * (32768 + 512 + 128));
  EXPECT_DOUBLE_EQ(calibration_bytes_estimate(c, Format::fp8), 512.0 * 4);
  EXPECT_DOUBLE_EQ(calibration_bytes_estimate(c, Format::int4), 0.0);
  // Independent of users and context.
  PlanOptions o = options("llama-3.1-8b", "h100-80gb", 1);
  double a = make_plan(o).row(Format::q4).calibration_bytes;
  o.users = 7;
  o.context = 1000;
  EXPECT_EQ(make_plan(o).row(Format::q4).calibration_bytes, a);
}

// ---- invariants on random inputs

TEST(Plan, RandomInputsRespectTheBudget) {
  std::mt19937 rng(42);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 200; ++trial) {
    PlanOptions o = options(trial % 2 ? "llama-3.1-8b" : "smollm2-135m", trial % 3 ? "h100-80gb" : "h200-141gb", 1);
    o.tp = 1 << pick(0, 3);
    if (o.model.config.n_kv_heads % o.tp != 0 && o.tp % o.model.config.n_kv_heads != 0) o.tp = 1;
    o.context = pick(1, 400000);
    o.users = pick(1, 100000);
    o.fleet_gpus = pick(0, 5000);
    o.activation_bytes = pick(0, 8) * 1e9;
    Plan p = make_plan(o);
    int64_t prev_users = -1;
    double prev_bytes = 0;
    for (const auto& r : p.rows) {
      // floor: the users fit, one more does not.
      EXPECT_LE(r.users_per_replica * r.kv_bytes_per_user, p.kv_budget_bytes);
      EXPECT_GT((r.users_per_replica + 1) * r.kv_bytes_per_user, p.kv_budget_bytes);
      if (r.fits) {
        EXPECT_GE(r.gpus_needed / o.tp * r.users_per_replica, o.users);
        EXPECT_LT((r.gpus_needed / o.tp - 1) * r.users_per_replica, o.users);
        EXPECT_EQ(r.gpus_billed % o.gpus_per_node, 0);
        EXPECT_GE(r.gpus_billed, r.gpus_needed);
        EXPECT_LT(r.gpus_billed - r.gpus_needed, o.gpus_per_node);
      }
      // Fewer bytes per user never serve fewer users. (Not "fewer bits": below ~100 tokens q4's bf16 sinks cost
      // more than int4's extra half bit.)
      if (prev_users >= 0 && r.kv_bytes_per_user <= prev_bytes) EXPECT_GE(r.users_per_replica, prev_users);
      if (prev_users >= 0 && r.kv_bytes_per_user >= prev_bytes) EXPECT_LE(r.users_per_replica, prev_users);
      prev_users = r.users_per_replica;
      prev_bytes = r.kv_bytes_per_user;
    }
  }
}

// ---- TP accounting

TEST(Plan, TpBeyondKvHeadsReplicatesHeads) {
  PlanOptions o = options("llama-3.1-8b", "h100-80gb", 16);
  o.gpus_per_node = 16;
  Plan p = make_plan(o);
  EXPECT_EQ(p.kv_replication, 2);
  EXPECT_EQ(p.row(Format::fp8).kv_bytes_per_user, 2 * 8589934592.0);
  EXPECT_FALSE(p.notes.empty());
}

// ---- models from files

TEST(Plan, ModelFromHfConfig) {
  ModelSpec m = load_model_spec(hf("qwen2-7b.json"));
  EXPECT_EQ(m.config.n_params, 7615616512);
  EXPECT_DOUBLE_EQ(m.weight_bytes, 7615616512.0 * 2);
  // Presets are the published configs: identical to the committed fixtures.
  for (auto [key, file] : {std::pair{"llama-3.1-8b", "llama-3.1-8b.json"}, std::pair{"llama-3.1-70b", "llama-3.1-70b.json"},
                           std::pair{"smollm2-135m", "smollm2-135m-instruct.json"}}) {
    SCOPED_TRACE(key);
    ModelSpec preset = load_model_spec(key);
    ModelSpec fixture = load_model_spec(hf(file));
    EXPECT_EQ(preset.config.n_params, fixture.config.n_params);
    EXPECT_EQ(preset.config.kv_elements_per_token(), fixture.config.kv_elements_per_token());
    EXPECT_EQ(preset.config.max_context, fixture.config.max_context);
    EXPECT_EQ(preset.weight_bytes, fixture.weight_bytes);
  }
}

TEST(Plan, ModelFromGguf) {
  const char* env = std::getenv("KVPACK_MODEL");
  const std::string path = env && *env ? env : std::string(KVPACK_SOURCE_DIR) + "/models/smollm2-135m-instruct.gguf";
  if (!std::filesystem::exists(path)) {
    const char* req = std::getenv("KVPACK_REQUIRE_MODEL");
    if (req && std::string(req) == "1") FAIL() << "model missing: " << path << " (KVPACK_REQUIRE_MODEL=1)";
    GTEST_SKIP() << "model not found: " << path;
  }
  ModelSpec m = load_model_spec(path);
  EXPECT_EQ(m.config.kv_elements_per_token(), 11520);  // 2 x 30 layers x 3 KV heads x 64
  // Weight bytes of a GGUF are its tensor data: 272 tensors, Q4_1/Q8_0/F32, 96,576,768 bytes (gguf-py's count).
  EXPECT_DOUBLE_EQ(m.weight_bytes, 96576768.0);
  // The same shape as the published HF config (the GGUF was converted from it).
  ModelConfig hfc = model_config_from_hf_json(hf("smollm2-135m-instruct.json"));
  EXPECT_EQ(m.config.n_layers, hfc.n_layers);
  EXPECT_EQ(m.config.n_kv_heads, hfc.n_kv_heads);
  EXPECT_EQ(m.config.head_dim, hfc.head_dim);
  EXPECT_EQ(m.config.n_params, hfc.n_params);
  PlanOptions o;
  o.model = m;
  o.gpu = gpu_preset("h100-80gb");
  o.context = 8192;
  Plan p = make_plan(o);
  // 0.92 x 81,559 MiB - 96,576,768 - 4e9 = 74,582,568,417 bytes over 8,192 x 11,520 bytes per fp8 user.
  EXPECT_EQ(p.row(Format::fp8).users_per_replica, 790);
}

TEST(Plan, WeightBytesOverride) {
  PlanOptions o = options("llama-3.1-8b", "h100-80gb", 1);
  o.weight_bytes = 8.03e9;  // fp8 weights
  Plan p = make_plan(o);
  EXPECT_NEAR(p.kv_budget_bytes, 0.92 * 81559.0 * 1048576 - 8.03e9 - 4e9, 1e-3);
  EXPECT_EQ(p.row(Format::fp8).users_per_replica, 7);
  o.weight_bytes.reset();
  o.kv_budget_bytes = 58.6e9;
  EXPECT_EQ(make_plan(o).row(Format::q4).users_per_replica, 13);
}

// ---- bad input

TEST(Plan, BadInputs) {
  expect_error([] { load_model_spec("llama-9"); }, {"llama-9", "llama-3.1-8b"});
  expect_error([] { load_model_spec(""); }, {"no model"});
  expect_error([] { load_model_spec(hf("bad-truncated.json")); }, {"bad-truncated.json", "not valid JSON"});
  expect_error([] { load_model_spec(hf("bad-zero-vocab.json")); }, {"vocab_size", "positive"});
  expect_error([] { gpu_preset("a100"); }, {"a100", "h100-80gb", "h200-141gb"});
  expect_error([] { parse_memory_convention("marketing"); }, {"marketing"});
  EXPECT_EQ(gpu_preset("h200").key, "h200-141gb");

  auto bad = [](const std::function<void(PlanOptions&)>& edit, std::vector<std::string> parts) {
    PlanOptions o = options("llama-3.1-8b", "h100-80gb", 1);
    edit(o);
    expect_error([&] { make_plan(o); }, parts);
  };
  bad([](PlanOptions& o) { o.tp = 0; }, {"--tp", "0"});
  bad([](PlanOptions& o) { o.tp = -2; }, {"--tp", "-2"});
  bad([](PlanOptions& o) { o.tp = 3; }, {"--tp 3", "node of 8"});
  bad([](PlanOptions& o) { o.gpus_per_node = 0; }, {"--gpus-per-node"});
  bad([](PlanOptions& o) { o.context = 0; }, {"--context", "0"});
  bad([](PlanOptions& o) { o.context = -5; }, {"--context", "-5"});
  bad([](PlanOptions& o) { o.users = 0; }, {"--users"});
  bad([](PlanOptions& o) { o.mem_fraction = 1.5; }, {"--mem-fraction", "1.5"});
  bad([](PlanOptions& o) { o.mem_fraction = 0; }, {"--mem-fraction"});
  bad([](PlanOptions& o) { o.activation_bytes = -1e9; }, {"--activation-gb"});
  bad([](PlanOptions& o) { o.weight_bytes = -1; }, {"weight size", "negative"});
  bad([](PlanOptions& o) { o.gpu_memory_bytes = 0; }, {"GPU memory", "positive"});
  bad([](PlanOptions& o) { o.gpu_memory_bytes = -80e9; }, {"GPU memory", "positive"});
  bad([](PlanOptions& o) { o.kv_budget_bytes = 0; }, {"--kv-budget-gb", "positive"});
  bad([](PlanOptions& o) { o.reserved_usd_per_gpu_year = -1; }, {"prices"});
  bad([](PlanOptions& o) { o.model.config.n_kv_heads = 0; }, {"n_kv_heads", "positive"});
  // 70B does not fit one H100: the message says why and what to do.
  PlanOptions o = options("llama-3.1-70b", "h100-80gb", 1);
  expect_error([&] { make_plan(o); }, {"Llama-3.1-70B", "does not fit", "141.11 GB", "--tp"});
  // SmolLM2's 3 KV heads cannot be split over TP 2.
  PlanOptions s = options("smollm2-135m", "h100-80gb", 2);
  expect_error([&] { make_plan(s); }, {"--tp 2", "3 KV heads"});
}

TEST(Plan, ContextTooLongForOneUserIsReportedNotFaked) {
  PlanOptions o = options("llama-3.1-8b", "h100-80gb", 1);
  o.context = 8000000;  // 8M tokens of bf16 = 1 TB per user
  Plan p = make_plan(o);
  EXPECT_FALSE(p.row(Format::bf16).fits);
  EXPECT_EQ(p.row(Format::bf16).users_per_replica, 0);
  EXPECT_EQ(p.row(Format::bf16).gpus_needed, 0);
  json j = json::parse(plan_json(p));
  EXPECT_TRUE(rows_by_format(j)["bf16"]["gpus_needed"].is_null());
  EXPECT_NE(plan_table(p).find("n/a"), std::string::npos);
}

// ---- the CLI (KVPACK_CLI_PATH): the interface commands from the issue

TEST(PlanCli, Published8BJson) {
  CliResult r = run_cli("plan --model llama-3.1-8b --gpu h100-80gb --context 131072 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(std::round(j.at("kv_budget_bytes").get<double>() / 1e8) / 10, 58.6);
  auto rows = rows_by_format(j);
  ASSERT_EQ(rows.size(), all_formats().size());
  const std::map<std::string, int> want = {{"fp8", 6}, {"int4", 12}, {"q4", 13}, {"q3.5", 15}};
  for (const auto& [name, users] : want) {
    SCOPED_TRACE(name);
    const json& row = rows.at(name);
    EXPECT_EQ(row.at("users_per_gpu").get<double>(), users);
    EXPECT_EQ(row.at("users_per_node").get<int64_t>(), users * 8);
    EXPECT_EQ(row.at("bits_per_element").get<double>(), format_info(*parse_format(name)).bits_per_element);
    for (const char* k : {"kv_bytes_per_user", "cost_reserved_usd_per_year", "cost_on_demand_usd_per_year",
                          "saving_vs_fp8_reserved_usd_per_year", "gpus_needed", "nodes_needed"})
      EXPECT_TRUE(row.contains(k)) << k;
  }
  EXPECT_EQ(rows.at("fp8").at("fleet_users").get<int64_t>(), 6000);
  EXPECT_EQ(rows.at("fp8").at("kv_bytes_per_user").get<double>(), 8589934592.0);
  EXPECT_EQ(rows.at("fp8").at("cost_reserved_usd_per_year").get<double>(), 168 * 17500.0);
}

TEST(PlanCli, Published70BJson) {
  CliResult r = run_cli("plan --model llama-3.1-70b --gpu h100-80gb --tp 8 --gpus-per-node 8 --context 131072 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(std::llround(j.at("kv_budget_bytes").get<double>() / 1e9), 416);
  EXPECT_EQ(j.at("gpu").at("memory_bytes").get<double>(), 80e9);
  auto rows = rows_by_format(j);
  const std::map<std::string, int> want = {{"fp8", 19}, {"int4", 34}, {"q4", 38}, {"q3.5", 44}};
  for (const auto& [name, users] : want) {
    SCOPED_TRACE(name);
    EXPECT_EQ(rows.at(name).at("users_per_node").get<int64_t>(), users);
    EXPECT_DOUBLE_EQ(rows.at(name).at("users_per_gpu").get<double>(), users / 8.0);
  }
}

TEST(PlanCli, TableAndOptions) {
  CliResult r = run_cli("plan --model llama-3.1-8b --formats fp8,q3.5 --users 6000");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("58.62 GB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("81559 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("q3.5"), std::string::npos);
  EXPECT_EQ(r.out.find("int4"), std::string::npos);
  // Explicit memory and a custom GPU.
  r = run_cli("plan --model llama-3.1-8b --gpu-memory-mib 81559 --formats fp8 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(j["gpu"]["key"], "custom");
  EXPECT_EQ(j["formats"][0]["users_per_gpu"].get<double>(), 6);
  r = run_cli("plan --model llama-3.1-8b --kv-budget-gb 58.6 --formats q4 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["formats"][0]["users_per_gpu"].get<double>(), 13);
  r = run_cli("plan --model " + hf("qwen2-7b.json") + " --gpu h200 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["model"]["n_params"].get<int64_t>(), 7615616512);
}

TEST(PlanCli, BadInputsExitWithAClearError) {
  struct Case {
    std::string args, needle;
  };
  const std::vector<Case> cases = {
      {"plan --model nope", "error: model 'nope' is neither a preset"},
      {"plan --model llama-3.1-8b --gpu b300", "unknown GPU preset 'b300'"},
      {"plan --model llama-3.1-8b --context 0", "--context must be a positive"},
      {"plan --model llama-3.1-8b --context -1", "--context"},
      {"plan --model llama-3.1-8b --tp 0", "--tp must be a positive"},
      {"plan --model llama-3.1-8b --gpu-memory-gb -80", "GPU memory must be positive"},
      {"plan --model llama-3.1-8b --weight-bytes -5", "weight size must not be negative"},
      {"plan --model llama-3.1-8b --formats q4,q9", "unknown format 'q9'"},
      {"plan --model llama-3.1-70b", "does not fit"},
      {"plan --model " + hf("bad-missing-layers.json"), "num_hidden_layers"},
      {"plan --model " + hf("qwen2-7b.json") + " --memory-convention vibes", "unknown memory convention"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    CliResult r = run_cli(c.args, true);
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << r.out;
  }
}
